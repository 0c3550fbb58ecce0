public enum MicroHTTPDPlaceholder {}
