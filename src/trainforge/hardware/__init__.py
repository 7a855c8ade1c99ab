"""Hardware facts and device handling."""
