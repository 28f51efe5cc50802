"""mend inside the trainers people use; each module imports its framework
only when it is itself imported.

- ``mend.integrations.transformers.MendCallback``: a transformers
  ``TrainerCallback`` (``Trainer(..., callbacks=[MendCallback(config)])``).
- ``mend.integrations.lightning.MendCallback``: a Lightning ``Callback``
  (``Trainer(callbacks=[MendCallback(config)])``).
- Accelerate needs none: ``mend_init(model, config, optimizer=opt)`` takes
  the optimizer ``accelerator.prepare`` returned.
"""
