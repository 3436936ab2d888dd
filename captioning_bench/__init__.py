"""``captioning-bench``: each benchmark times this code against a baseline in the same run."""
