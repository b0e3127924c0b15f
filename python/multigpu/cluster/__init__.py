"""Which cluster a process belongs to, and how workers say they joined it.
"""
