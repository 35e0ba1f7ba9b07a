"""The frozen held-out split: hand-written questions nobody tunes on, scored only into a ledger."""
