"""What the Spark formats share: options parsed in one place, the row schema and its Arrow
columns, trigger pacing, one-line errors, Spark-version differences and worker GC."""
