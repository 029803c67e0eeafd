"""The ``debate`` environment: MAPoRL's collaborative debate (MAPoRL, Section 3.1).

:mod:`~collab.envs.debate.env` holds :class:`DebateEnv` (built by ``make_env("debate", ...)``);
:mod:`~collab.envs.debate.prompts` the turn-1 and debate prompts; :mod:`~collab.envs.debate.datasets`
the NLI data (CB, RTE, ANLI) and label extraction (math data comes from :mod:`collab.envs.math`);
:mod:`~collab.envs.debate.verifier` the rule verifier (the learned one, built outside ``envs/``:
:mod:`collab.envs.debate.learned_verifier`, trained on the labelled answers of
:mod:`collab.envs.debate.verifier_examples`); :mod:`~collab.envs.debate.arrow` reads the ``datasets`` cache files
that hold CB and RTE. Submodules are imported on use.
"""
