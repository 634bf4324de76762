"""AIAgent: ``run_conversation()`` with tools, cut as one unit.

Imports ``wirecut.scope``, ``wirecut.http`` and ``wirecut.provider``. A turn
runs in a child of the bound scope; a cancel of that scope, or
``agent.interrupt()``, cuts its request, its tools' processes and threads and
its child agents, and the turn ends with status "interrupted".
"""

from wirecut.agent._agent import AIAgent, ConversationResult, ConversationStatus
from wirecut.agent._builtins import delegate_tool, http_get_tool, shell_tool
from wirecut.agent._tools import Tool, ToolCallError, ToolRegistry, tool

__all__ = [
    "AIAgent",
    "ConversationResult",
    "ConversationStatus",
    "Tool",
    "ToolCallError",
    "ToolRegistry",
    "delegate_tool",
    "http_get_tool",
    "shell_tool",
    "tool",
]
