"""The model: ResNet-18, on-device augmentation, the loss, learning-rate schedules, the saved inference model and prediction. May import train/data and preprocess/."""
