"""The async runtime that drives core, the HTTP app, configuration and the CLI."""
