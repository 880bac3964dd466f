"""The plugin host: hook specifications, the registry of named factories, the plugin
manager (built-ins by name, installed entry points, in-process and ``--plugin`` modules),
and ``chains`` (a resolved config into a request's built components)."""
