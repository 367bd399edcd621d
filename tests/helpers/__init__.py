"""What several test files share: synthetic run folders, fake trainers, cluster and CLI helpers."""
