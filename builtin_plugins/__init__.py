"""kernelcore's built-in plugins. Each subpackage reaches the core through an entry
point in pyproject.toml, exactly as a third-party package would."""
