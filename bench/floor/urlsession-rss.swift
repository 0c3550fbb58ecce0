// The floor under Portico's resident memory: a Swift program that only loads Foundation and
// FoundationNetworking (which the `urlsession` transport and the token client need), makes one
// URLSession request, and idles. bench/cpu --floors builds it as Portico ships (statically
// linked) and reports its RSS beside Portico's.
//
//   urlsession-rss URL
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

let session = URLSession(configuration: .ephemeral)
guard CommandLine.arguments.count == 2, let url = URL(string: CommandLine.arguments[1]) else {
    print("usage: urlsession-rss URL")
    exit(2)
}
let (_, response) = try await session.data(from: url)
print((response as? HTTPURLResponse)?.statusCode ?? 0)
try await Task.sleep(for: .seconds(24 * 3600))
