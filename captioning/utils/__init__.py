"""Small shared helpers (atomic file writes, JSON reading)."""
