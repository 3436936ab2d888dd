"""Annotation formats, one module each: a reader registered in
``captioning.data.annotations.ANNOTATION_FORMATS``."""
