"""What a training process needs below the models: the collectives that keep every rank's update the same
(:mod:`~collab.runtime.collectives`), the lockstep forwards of sharded models (:mod:`~collab.runtime.lockstep`),
a process's random state for a checkpoint (:mod:`~collab.runtime.rank_state`), micro-batches from a memory budget
(:mod:`~collab.runtime.memory`), files replaced whole (:mod:`~collab.runtime.files`) and the libraries' warnings
ignored at ``import collab`` (:mod:`~collab.runtime.library_warnings`). Submodules are imported on use."""
