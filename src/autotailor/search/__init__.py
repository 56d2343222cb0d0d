"""Architecture search: beam-initialised evolution under budgets, and the Pareto front."""

from autotailor.search.evolution import (Choice, EvolutionSettings, SearchResult, beam_search, evolve, pareto_front,
                                         rank, search)
from autotailor.search.objectives import METRICS, Budget, Objectives, SearchError, parse_budget_label

__all__ = ["METRICS", "Budget", "Choice", "EvolutionSettings", "Objectives", "SearchError", "SearchResult",
           "beam_search", "evolve", "parse_budget_label", "pareto_front", "rank", "search"]
