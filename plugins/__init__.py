"""ortgen's built-in components, registered exactly like a third-party plugin."""

#: Modules registered by name before installed plugins; block one by that name with
#: ``ortgen.load(disable_plugins=[...])``.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "ortgen.plugins.processors",
    "ortgen.plugins.samplers",
    "ortgen.plugins.beam_search",
    "ortgen.plugins.constraints",
    "ortgen.plugins.token_rules",
    "ortgen.plugins.truncation",
    "ortgen.plugins.openai_penalties",
    "ortgen.plugins.llamacpp",
    "ortgen.plugins.grammar",
    "ortgen.plugins.stopping",
    "ortgen.plugins.caches",
    "ortgen.plugins.kv_window",
    "ortgen.plugins.kv_quantized",
    "ortgen.plugins.kv_prefix",
    "ortgen.plugins.kv_slots",
    "ortgen.plugins.drafters",
    "ortgen.plugins.draft_model",
    "ortgen.plugins.chat_formats",
    "ortgen.plugins.thinking",
)
