-- A small bookshop, as a user might bring it: six tables with keys, rows built from a seed.
-- Loaded by `sqltasks.sources` (the rows are copied, so the sandbox never re-runs this file).

CREATE TABLE authors (
  author_id INTEGER PRIMARY KEY,
  full_name VARCHAR NOT NULL,
  country VARCHAR,
  born_year INTEGER
);
CREATE TABLE books (
  book_id INTEGER PRIMARY KEY,
  title VARCHAR NOT NULL,
  author_id INTEGER REFERENCES authors (author_id),
  genre VARCHAR,
  published_year INTEGER,
  list_price DECIMAL(8, 2)
);
CREATE TABLE customers (
  customer_id INTEGER PRIMARY KEY,
  first_name VARCHAR,
  last_name VARCHAR,
  city VARCHAR,
  joined_on DATE
);
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  customer_id INTEGER REFERENCES customers (customer_id),
  ordered_on DATE,
  status VARCHAR
);
CREATE TABLE order_items (
  order_id INTEGER REFERENCES orders (order_id),
  book_id INTEGER REFERENCES books (book_id),
  quantity INTEGER,
  unit_price DECIMAL(8, 2)
);
CREATE TABLE reviews (
  review_id INTEGER PRIMARY KEY,
  book_id INTEGER REFERENCES books (book_id),
  customer_id INTEGER REFERENCES customers (customer_id),
  stars INTEGER,
  reviewed_on DATE
);

INSERT INTO authors VALUES
  (1, 'Ana Ribeiro', 'Portugal', 1961), (2, 'Kenji Sato', 'Japan', 1975),
  (3, 'Mary Okafor', 'Nigeria', 1982), (4, 'Lars Eriksen', 'Norway', 1958),
  (5, 'Chloe Martin', 'France', 1990), (6, 'Diego Alvarez', 'Chile', 1969),
  (7, 'Priya Nair', 'India', 1979), (8, 'Tom Fletcher', 'United Kingdom', 1985),
  (9, 'Ingrid Holm', 'Norway', 1972), (10, 'Samuel Adeyemi', 'Nigeria', 1966),
  (11, 'Nadia Petrova', 'Bulgaria', 1988);

INSERT INTO books
SELECT i,
       ['The', 'A', 'Under', 'After', 'Beyond'][1 + i % 5] || ' ' ||
       ['Harbour', 'Winter', 'Garden', 'Signal', 'River', 'Archive', 'Lantern'][1 + i % 7] ||
       ' ' || i,
       1 + (i * 7) % 10,
       ['fiction', 'mystery', 'history', 'science', 'poetry', 'travel'][1 + (i * 5) % 6],
       1995 + (i * 13) % 29,
       CAST(8 + (i * 37) % 30 + 0.99 AS DECIMAL(8, 2))
FROM range(1, 45) t(i);

INSERT INTO customers
SELECT i,
       ['Alice', 'Bruno', 'Chen', 'Dana', 'Emeka', 'Fatima', 'Gus', 'Hana', 'Ivan', 'Jun'][1 + i % 10],
       ['Smith', 'Costa', 'Li', 'Novak', 'Obi', 'Haddad', 'Berg', 'Mori'][1 + (i * 3) % 8],
       ['Lisbon', 'Oslo', 'Lagos', 'Lyon', 'Pune', 'Leeds'][1 + (i * 7) % 6],
       DATE '2019-01-01' + INTERVAL (i * 41) DAY
FROM range(1, 35) t(i);

INSERT INTO orders
SELECT i,
       1 + (i * 11) % 30,
       DATE '2023-01-01' + INTERVAL (i * 5) DAY,
       ['delivered', 'delivered', 'delivered', 'shipped', 'cancelled'][1 + (i * 3) % 5]
FROM range(1, 81) t(i);

INSERT INTO order_items
SELECT o, 1 + (o * 13 + k * 17) % 40, 1 + (o + k) % 3,
       (SELECT list_price FROM books WHERE book_id = 1 + (o * 13 + k * 17) % 40)
FROM range(1, 81) a(o), range(0, 3) b(k)
WHERE k < 1 + o % 3;

INSERT INTO reviews
SELECT i, 1 + (i * 19) % 40, 1 + (i * 7) % 30, 1 + (i * 13) % 5,
       DATE '2023-02-01' + INTERVAL (i * 4) DAY
FROM range(1, 91) t(i);
