// Starts a real Neo4j 5.26 Community database with its Bolt server, for local
// development and CI where no Docker engine or packaged server is available.
// Usage: java -Xmx512m -cp 'lib/*' Launcher.java HOME_DIR
// Reads HOME_DIR/neo4j.conf, listens where that file says, and stops on SIGTERM.
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;

public class Launcher {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: Launcher HOME_DIR");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .loadPropertiesFromFile(home.resolve("neo4j.conf"))
                .build();
        // Touch the default database so a failed start surfaces here, not on first query.
        dbms.database("neo4j").executeTransactionally("RETURN 1");
        CountDownLatch stop = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            dbms.shutdown();
            stop.countDown();
        }));
        System.out.println("neo4j ready on " + home);
        System.out.flush();
        stop.await();
    }
}
