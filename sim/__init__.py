"""The deterministic simulator: server.runtime under trio's virtual clock with fake sessions."""
