"""A model folder and its graph: ``session`` (``ExportedModel``, ``GraphSignature``, the
session every thread shares), ``locate`` (a path or a GGUF file to a folder), ``paths``
(where models live) and ``manifest`` (what made a folder)."""
