"""Result records (results.jsonl, schema-versioned) and what is made of them: report.md, results.csv, plots, the
spread over trials (stats) and whether the numbers can be trusted (trust)."""
