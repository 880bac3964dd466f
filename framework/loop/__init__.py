"""The loop, the one folder to read first: the step object and what it is made of.

``generate.Generation`` is the step object every caller drives (``generate()``,
``stream()``, chat sessions, the server's continuous batch, pipelines). Its parts:
``rows`` (every per-row field in one container), ``feeding`` (what the cache has not
seen goes to the model), ``picking`` (processors, sampler and stopping criteria per
settings group, errors isolated per row), ``following`` (stateful components and the
tokens they force), ``continuing`` (fork, teacher forcing, append, rewind),
``admission`` (rows joining and leaving an open batch), ``step_report`` (what a step
or an admission did, per row, for the caller), ``step_record`` (logprobs and
scores kept per row), ``scoring`` and ``component_checks`` (calling components and
checking their answers), ``chain`` (a request's components as plain callables).

Nothing here imports a plugin or the plugin host: components arrive built.
"""
