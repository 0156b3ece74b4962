"""Framework integrations: one package per training framework (verl first).

Each is a leaf over kvctl's public API (kvctl.api) and the run records (kvctl.serve.runs): nothing
in kvctl imports this package, and `import kvctl` never loads it. Each imports its framework lazily,
only in the process where that framework's trainer runs (tests/unit/integrations checks both).
"""
