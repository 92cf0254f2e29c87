"""Workbook plumbing: recording values from notebooks and running them with papermill."""

from glm5lib.workbook.record import read_report, record

__all__ = ["record", "read_report"]
