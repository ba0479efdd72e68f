"""Whole-graph passes: functions from Graph to Graph (or to facts about a Graph)."""
