"""Competitive programming (MARFT, 5.1, D.3, E.2): CodeForces-style stdin/stdout problems, judged by
test pass rate. :mod:`.problems` loads and checks, :mod:`.judge` runs programs, :mod:`.env` is the Flex-MG."""
