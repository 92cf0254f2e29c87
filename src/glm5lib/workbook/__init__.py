"""Workbook plumbing (floor 7): recording values from notebooks and running them with papermill.

A change goes here when it is about executing or checking notebooks; what a notebook computes belongs in the
package the notebook is about."""

from glm5lib.workbook.record import read_report, record

__all__ = ["record", "read_report"]
