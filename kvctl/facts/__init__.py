"""What each vLLM and Mooncake release does, as data: the capability table (kvctl/data, generated
from the released sources), version parsing, the compat verdicts built on them, Mooncake's facts and
log patterns, sizes, and the layout of a rendered bundle. Everything else reads its version facts
from here; nothing here talks to a server.
"""
