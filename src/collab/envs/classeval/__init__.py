"""ClassEval class completion by a team (:mod:`collab.envs.classeval.env`)."""
