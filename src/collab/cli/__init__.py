"""Bad input, checked before a run starts: one ``error:`` line, nothing else on stderr.

The command-line entries (``collab.fit``, ``collab.evaluate``) meet one contract for every bad input: exactly one
line on stderr naming the option and what would be valid, exit code 2, no traceback, nothing written over
(docs/usage.md, *Bad input*). This package holds the parts of it that are not a single ``require`` next to an
option (docs/layout.md lists its modules). The warnings that libraries raise about their own code are not this
package's: ``import collab`` ignores them (:mod:`collab.runtime.library_warnings`).
"""
