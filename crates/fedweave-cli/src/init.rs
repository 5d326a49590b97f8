//! `fedweave init`: a commented configuration that runs, for an algorithm
//! and a dataset.

/// What suits a dataset: model, partition lines, training lines, and a
/// note for datasets read from disk.
struct Preset {
    model: &'static str,
    partition: &'static str,
    train: &'static str,
    data: &'static str,
    clients: usize,
}

const IMAGES: Preset = Preset {
    model: "cnn",
    partition: "kind = \"pathological\"    # iid | dirichlet | pathological | shards | groups | natural\nclasses_per_client = 2   # pathological: pFedGraph's label skew\n# beta = 0.5             # dirichlet",
    train: "local_iterations = 50    # mini-batch steps per round (0: use local_epochs)\nbatch_size = 64\nlr = 0.01",
    data: "# path = \"/path/to/the/dataset\"   # the folder as extracted from the published archive",
    clients: 10,
};

const FORECAST: Preset = Preset {
    model: "gru",
    partition: "kind = \"natural\"         # one client per station / sensor",
    train: "local_iterations = 0     # 0: use local_epochs\nlocal_epochs = 1\nbatch_size = 32\nlr = 0.05",
    data: "input_steps = 12         # past steps the model sees\nhorizon = 3              # steps ahead it forecasts",
    clients: 0,
};

fn preset(dataset: &str) -> Preset {
    let natural = "kind = \"natural\"         # the dataset's own clients";
    match dataset {
        "digits" => Preset {
            model: "mlp",
            partition: "kind = \"pathological\"    # iid | dirichlet | pathological | shards | groups | natural\nclasses_per_client = 2   # pathological: pFedGraph's label skew\n# beta = 0.5             # dirichlet",
            train: "local_iterations = 20    # mini-batch steps per round (0: use local_epochs)\nbatch_size = 32\nlr = 0.05",
            data: "# bundled with fedweave: runs anywhere",
            clients: 10,
        },
        "synthetic" => Preset {
            model: "mlp",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "# generated from the seed: runs anywhere",
            clients: 10,
        },
        "us-weather" => Preset {
            data: "input_steps = 12         # past days the model sees\nhorizon = 3              # days ahead it forecasts (MAE in °C)\n# bundled with fedweave: runs anywhere",
            clients: 144,
            ..FORECAST
        },
        "pems04" | "pems08" | "metr-la" | "pems-bay" => Preset {
            data: "path = \"/path/to/traffic\"   # the folder holding the dataset's .npz (see `fedweave list`)\ninput_steps = 12\nhorizon = 3",
            clients: 10,
            ..FORECAST
        },
        "femnist" => Preset {
            partition: natural,
            data: "path = \"/path/to/femnist\"   # LEAF's train/ and test/ folders",
            ..IMAGES
        },
        "cifar10" | "cifar100" | "cinic10" | "tiny-imagenet" => Preset {
            model: "resnet8",
            ..IMAGES
        },
        "shakespeare" => Preset {
            model: "textcnn",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "path = \"/path/to/shakespeare\"   # LEAF's train/ and test/ folders",
            clients: 10,
        },
        "yahoo-answers" => Preset {
            model: "textcnn",
            partition: "kind = \"dirichlet\"\nbeta = 0.5",
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "path = \"/path/to/yahoo-answers\"   # train.csv and test.csv",
            clients: 10,
        },
        "movielens-100k" => Preset {
            model: "mf",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "path = \"/path/to/ml-100k\"   # the folder holding u.data",
            clients: 10,
        },
        "csv" => Preset {
            model: "mlp",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "path = \"/path/to/clients/{id}\"   # each client's train.csv and test.csv\nclasses = 10",
            clients: 10,
        },
        "pfllib" => Preset {
            model: "mlp",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 10\nlr = 0.005",
            data: "path = \"/path/to/PFLlib/dataset/MNIST\"   # PFLlib's config.json, train/ and test/ (clients = its num_clients)",
            clients: 20,
        },
        "image-folder" => Preset {
            model: "mlp",
            partition: natural,
            train: "local_iterations = 20\nbatch_size = 32\nlr = 0.05",
            data: "path = \"/path/to/clients/{id}\"   # each client's train/<class>/ and test/<class>/ images\nimage_size = 32          # resize every image to 32x32 (or [height, width])\n# channels = 1           # grayscale (default 3: RGB)",
            clients: 10,
        },
        _ => IMAGES,
    }
}

/// The commented configuration for `algorithm` on `dataset` (both checked
/// by the caller).
pub fn template(algorithm: &str, dataset: &str) -> String {
    let p = preset(dataset);
    let clients = if p.clients == 0 { 10 } else { p.clients };
    format!(
        r#"# fedweave experiment: {algorithm} on {dataset}.
# Run it:     fedweave run THIS.toml --out runs/first
# Check it:   fedweave config THIS.toml        (prints every key with its default)
# Vary it:    fedweave run THIS.toml --set rounds=5 --set partition.kind=iid
# Names:      fedweave list                    (algorithms, datasets, models, ...)

seed = 1                 # every random draw derives from it: same seed, same numbers
clients = {clients}             # N clients in the federation
rounds = 20              # communication rounds
# participation = 1.0    # fraction of clients taking part in each round
# threads = 2            # default: all cores; results do not depend on it
# checkpoint_every = 1   # rounds between checkpoints (`fedweave resume DIR` continues)

[data]
dataset = "{dataset}"
{data}

[partition]              # how the data is split between the clients
{partition}

[model]
kind = "{model}"
# your own architecture: kind = "sequential" with layers = [{{ type = "conv2d", out_channels = 6, kernel = 5 }}, ...]
# (README "Models"; `fedweave list` names the built-in ones)

[train]                  # each client's local training, every round
{train}
momentum = 0.9
weight_decay = 1e-5

[algorithm]
name = "{algorithm}"
# the algorithm's own keys (README "Algorithms", `fedweave config` shows their defaults)

[attack]
kind = "none"            # none | shuffle | same_value | sign_flip | gaussian | label_flip
# ratio = 0.2            # fraction of clients that are malicious
"#,
        data = p.data,
        partition = p.partition,
        model = p.model,
        train = p.train,
    )
}
