"""ortgen's built-in components, registered exactly like a third-party plugin."""

#: Modules registered by name before installed plugins; block one by that name with
#: ``ortgen.load(disable_plugins=[...])``.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "ortgen.plugins.processors",
    "ortgen.plugins.samplers",
    "ortgen.plugins.constraints",
    "ortgen.plugins.stopping",
    "ortgen.plugins.caches",
)
