"""TensorFlow (``tf.distribute``) glue for lab 08; see ``mpkit.tf.distribute``."""
