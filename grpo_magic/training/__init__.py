"""One run: the checks before a model loads, the TRL adapter, ``train()`` and ``GRPORun``, resume, run folders."""
