"""Search-based question answering over a local corpus (Dr. MAS's search task): :mod:`collab.envs.search_qa.env`."""
