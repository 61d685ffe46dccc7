"""The round engine (the only writer of run state) and the modules it opens, closes, resumes and publishes with."""
