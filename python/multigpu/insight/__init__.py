"""Is it right, is it fast, will it fit: `check_equivalence`,
`ScalingMonitor` with its link model, `memory_plan`, and the plots.
"""
