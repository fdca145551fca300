"""presets."""
