/// The release, shown by `portico version`, the `Via`/`Server` headers and `portico_build_info`.
public enum PorticoVersion {
    public static let string = "0.1.0"
}
