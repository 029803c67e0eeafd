"""Bad input, checked before a run starts: one ``error:`` line, nothing else on stderr.

The command-line entries (``collab.fit``, ``collab.evaluate``) meet one contract for every bad input: exactly
one line on stderr (``error: ...``) naming the option and what would be valid, exit code 2, no traceback, and
nothing written over (a checkpoint or log already there stays as it was). This package holds the parts of it
that are not a single ``require`` next to an option:

- :mod:`collab.cli.output`: Lightning's start-up messages and the warnings shown meanwhile are kept back until
  the run really starts (``on_fit_start``, after the team is built and a checkpoint restored); a bad input found
  before then discards them. When stdout is not a terminal, Lightning's information lines ("GPU available: ...",
  "LOCAL_RANK: ...") and transformers' progress bars are not shown at all: a log holds collab's own lines;
- :mod:`collab.cli.parser_errors`: jsonargparse's multi-line reports (a value of the wrong type, a Union that
  does not validate, malformed YAML) as one line that keeps the reason;
- :mod:`collab.cli.trainer`: ``CollabCLI``, ``collab.fit``'s ``LightningCLI``: its options, the checks of the
  trainer options (``max_steps``, an accelerator the machine lacks) before the Trainer is built, and Lightning's own
  configuration errors as one line;
- :mod:`collab.cli.options`: where a run's logs go (``--trainer.default_root_dir``), which options were given,
  the valid option names (the algorithms' own vocabulary and their envs: :mod:`collab.algos.options`);
- :mod:`collab.cli.checkpoint`: a checkpoint that is missing, truncated, random bytes, not collab's, or of
  another algo or team shape;
- :mod:`collab.cli.resources`: more training processes than the machine holds, refused before they start.

The warnings that libraries raise about their own code are not this package's: ``import collab`` ignores them
(:mod:`collab.runtime.library_warnings`).
"""
