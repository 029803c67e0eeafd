"""The agents' policies: base models and their loading (:mod:`~collab.policy.models`: embedded SmolLM2, the
tiny random Llama, hub ids, QLoRA), the team of LoRA-adapted agents over shared bases
(:mod:`~collab.policy.team`), batched sampling with per-row adapters (:mod:`~collab.policy.sampling`) and
mixed-adapter batches (:mod:`~collab.policy.lora_batch`). Submodules are imported on use."""
