"""Small helpers with no ortgen layer under them: reading JSON files, one driver per
object at a time."""
