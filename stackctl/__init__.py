"""Starting and stopping one poolserve stack (Ray head + `serve run`), and finding its processes."""
