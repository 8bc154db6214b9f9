"""The Scheduler service: sessions, admission, block dispatch, interactive control."""
