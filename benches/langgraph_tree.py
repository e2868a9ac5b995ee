#!/usr/bin/env python3
"""The load test's tree in LangGraph, for benches/per_agent.sh.

The research-harness shape: a node's graph runs its (no-op) model, then fans
out with `Send` to a child graph, once per child; the child graph is itself a
compiled subgraph (a node of its parent's graph) that does the same, down to
depth D. Every agent's state carries the inherited history as LangGraph would
(messages in state with the `add_messages` reducer): the root starts with
HISTORY messages of MSG_BYTES bytes, each child starts with its parent's
messages plus one task message, and its model adds one message of its own.
No LLM: the "model" answers at once. Each graph reports how many agents ran
under it (an `operator.add` channel its output schema returns to the parent).

Prints one JSON line: agents, CPU seconds (this process, user + system, for
building and running the graphs, not for importing LangGraph), wall seconds.

Usage: langgraph_tree.py [--fanout 10] [--depth 4] [--history 100] [--msg-bytes 200]
"""

import argparse
import asyncio
import json
import operator
import resource
import sys
import time
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send


class AgentState(TypedDict):
    messages: Annotated[list, add_messages]
    agents: Annotated[int, operator.add]


class AgentOutput(TypedDict):
    agents: Annotated[int, operator.add]


def agent_graph(level: int, depth: int, fanout: int):
    """The compiled graph of an agent at `level` (0 is the root)."""
    graph = StateGraph(AgentState, output_schema=AgentOutput)

    async def model(state: AgentState):
        # The no-op model: one message of its own, and this agent counted.
        return {
            "messages": [AIMessage(content=f"agent at depth {level} done")],
            "agents": 1,
        }

    graph.add_node("model", model)
    graph.add_edge(START, "model")
    if level < depth:
        child = agent_graph(level + 1, depth, fanout)

        def spawn(state: AgentState):
            return [
                Send(
                    "child",
                    {
                        "messages": state["messages"]
                        + [HumanMessage(content=f"task {i} at depth {level + 1}")],
                        "agents": 0,
                    },
                )
                for i in range(fanout)
            ]

        graph.add_node("child", child)
        graph.add_conditional_edges("model", spawn, ["child"])
        graph.add_edge("child", END)
    else:
        graph.add_edge("model", END)
    return graph.compile()


def root_history(history: int, msg_bytes: int):
    messages = []
    for i in range(history):
        text = f"message {i}: "
        while len(text) < msg_bytes:
            text += "lorem ipsum "
        text = text[: max(msg_bytes, 1)]
        messages.append(HumanMessage(content=text) if i % 2 == 0 else AIMessage(content=text))
    return messages


def cpu_secs() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--history", type=int, default=100)
    parser.add_argument("--msg-bytes", type=int, default=200)
    args = parser.parse_args()
    if args.fanout < 1 or args.depth < 0:
        print("--fanout must be at least 1 and --depth at least 0", file=sys.stderr)
        return 2
    expected = sum(args.fanout**level for level in range(args.depth + 1))

    cpu0, wall0 = cpu_secs(), time.perf_counter()
    root = agent_graph(0, args.depth, args.fanout)
    history = root_history(args.history, args.msg_bytes)
    result = asyncio.run(
        root.ainvoke(
            {"messages": history + [HumanMessage(content="Measure the tree")], "agents": 0},
            # Each agent graph takes 2-3 steps; the default limit is per graph.
            {"recursion_limit": 100},
        )
    )
    cpu, wall = cpu_secs() - cpu0, time.perf_counter() - wall0
    agents = result["agents"]
    print(
        json.dumps(
            {
                "agents": agents,
                "expected": expected,
                "cpuSecs": round(cpu, 4),
                "wallSecs": round(wall, 4),
                "cpuUsPerAgent": round(cpu * 1e6 / max(agents, 1), 2),
                "fanout": args.fanout,
                "depth": args.depth,
                "history": args.history,
            }
        )
    )
    if agents != expected:
        print(f"{agents} agents ran, expected {expected}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
