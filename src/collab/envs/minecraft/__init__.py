"""The ``minecraft`` environment: HouseBuild (CoLLM, Section 5.1, Appendices E.3 and F.3).

:mod:`~collab.envs.minecraft.world` holds the voxel world, :mod:`~collab.envs.minecraft.commands`
parses the agents' commands, :mod:`~collab.envs.minecraft.threats` simulates the spiders,
:mod:`~collab.envs.minecraft.scoring` measures a build, :mod:`~collab.envs.minecraft.turn` plays one
turn (the fills, the fight, the reward), :mod:`~collab.envs.minecraft.prompts` writes the prompts and
feedback, :mod:`~collab.envs.minecraft.tasks` loads the houses and :mod:`~collab.envs.minecraft.env`
holds :class:`MinecraftEnv` (built by ``make_env("minecraft")``).

StrBuild, the authors' second Minecraft task (``make_env("str_build")``), shares the world and command types:
:mod:`~collab.envs.minecraft.strings` reads its strings and draws them, :mod:`~collab.envs.minecraft.str_rules` holds
its rules and reward, :mod:`~collab.envs.minecraft.str_prompts` its prompts and :mod:`~collab.envs.minecraft.str_env`
its :class:`~collab.envs.minecraft.str_env.StrBuildEnv`.
"""
