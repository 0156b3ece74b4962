"""kvctl's command line: parses, calls kvctl's core, prints. No logic of its own."""
