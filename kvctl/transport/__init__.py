"""How kvctl talks to servers: the HTTP layer (httpcore; aiohttp for large fleets) and its pool and
file budget, vLLM's dev and OpenAI routes, vLLM's /metrics, the Mooncake master's admin port, and
Mooncake's store client (in a child process). Nothing here decides what to send: reset/ and status do.
"""
