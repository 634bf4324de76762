"""AIAgent: ``run_conversation()`` with tools, cut as one unit.

Imports ``wirecut.scope``, ``wirecut.http``, ``wirecut.provider``,
``wirecut.record`` and, for MCP servers' tools only, ``wirecut.mcp``. A turn
runs in a child of the bound scope; a cancel of that scope, or
``agent.interrupt()``, cuts its request, its tools' processes, threads and
MCP calls and its child agents, and the turn ends with status "interrupted".
"""

from wirecut.agent._agent import AIAgent, ConversationResult, ConversationStatus
from wirecut.agent._builtins import delegate_tool, http_get_tool, shell_tool
from wirecut.agent._mcp_servers import McpServer, McpServers, McpServerSpec, McpServerStatus
from wirecut.agent._mcp_tools import McpCalls, McpToolSpec, mcp_tool, offered_tools, result_text
from wirecut.agent._tools import Tool, ToolCallError, ToolRegistry, tool

__all__ = [
    "AIAgent",
    "ConversationResult",
    "ConversationStatus",
    "McpCalls",
    "McpServer",
    "McpServerSpec",
    "McpServerStatus",
    "McpServers",
    "McpToolSpec",
    "Tool",
    "ToolCallError",
    "ToolRegistry",
    "delegate_tool",
    "http_get_tool",
    "mcp_tool",
    "offered_tools",
    "result_text",
    "shell_tool",
    "tool",
]
