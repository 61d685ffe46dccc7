"""Tasks: the model families, label space and data loader a federation trains (see ``base``)."""

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.tasks.base import CLASSIFICATION, DataContext, Objective, Task, accuracy
from edge_agent.tasks.registry import ENTRY_POINT_GROUP, TaskNotFound, installed_tasks, resolve_task

__all__ = ["CLASSIFICATION", "ENTRY_POINT_GROUP", "DataContext", "Dataset", "FedModel", "Objective", "Task",
           "TaskNotFound", "accuracy", "installed_tasks", "resolve_task"]
