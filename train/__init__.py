"""Training from prepared shards: tf.data reader, on-device augmentation, ResNet-18 and the training loop."""
