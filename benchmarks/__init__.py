"""`make bench`: kvctl's speed and scale against the alternatives (see docs/performance.md)."""
