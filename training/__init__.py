"""Training: job spec -> model, optimizer, data; the train loop. (Arrives with the work-package issue.)"""
