"""Every tfgpu command, and only commands: each turns its flags into validated settings and
calls the library below, which takes plain arguments and returns values. Here alone are flags
read, exit codes chosen and TensorFlow started quietly (``quiet``); ``app`` runs a command;
``head`` reads a trained run's config.json and opens it for the commands that use one (the
library below never reads config.json)."""
