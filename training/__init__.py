"""Training: job spec -> model, optimizer and data; the train loop."""
