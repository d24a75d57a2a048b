"""infrarsi inside other tools, each a thin adapter over the stages and the search core.

``ray_tune``: a Ray Tune searcher for your own Tune job; ``mcp_server``: the MCP server agents
use (``infrarsi mcp``).
"""
